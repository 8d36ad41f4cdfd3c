//! Kernels compiled by the adapter: for the device's own architecture (the control, NVRTC's
//! default, is another), with `-D` defines, templates by name expression and sources made at
//! run time; loaded functions cached (the lookup's host cost printed and bounded); a
//! grid-stride launch that is right for an empty tensor and past 2^32 elements, where
//! `LaunchConfig::for_num_elems(n as u32)` fails or wraps (the controls); and views of
//! borrowed tensors (`KernelTensor::borrowed`), whose owners the caller retires in one batch.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use tensorbridge_cudarc::{
    Arch, CompileOptions, Kernel, KernelArgs, KernelTensor, grid_stride, kernel, kernel_with,
};
use tensorbridge_testkit::DropCounter;

use crate::{context, serial};

/// Writes `__CUDA_ARCH__` (the architecture the code was compiled for) into `out[0]`.
const ARCH: &str = r#"
extern "C" __global__ void arch(int* out) { out[0] = __CUDA_ARCH__; }
"#;

#[test]
fn kernels_are_compiled_for_the_devices_own_architecture() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let s = ctx.new_stream()?;
    let (major, minor) = ctx.compute_capability()?;
    println!(
        "libnvrtc: {:?} (version {:?}); device sm_{major}{minor}",
        tensorbridge_cudarc::nvrtc_path(),
        tensorbridge_cudarc::nvrtc_version()
    );
    let mut seen = Vec::new();
    for options in [
        CompileOptions::new(),
        CompileOptions::new().arch(Arch::NvrtcDefault),
    ] {
        let f = kernel_with(&s, ARCH, "arch", &options)?;
        let mut out = s.alloc_zeros::<i32>(1)?;
        // SAFETY: `arch(int*)` writes one int.
        unsafe {
            s.launch_builder(&f)
                .arg(&mut out)
                .launch(LaunchConfig::for_num_elems(1))
        }?;
        seen.push(s.clone_dtoh(&out)?[0]);
    }
    println!(
        "__CUDA_ARCH__: {} for the device's own, {} for NVRTC's default",
        seen[0], seen[1]
    );
    ensure!(
        seen[0] == major * 100 + minor * 10,
        "compiled for {} on an sm_{major}{minor} device",
        seen[0]
    );
    ensure!(
        seen[1] != seen[0],
        "the control (NVRTC's default) compiled for the device too: the test proves nothing"
    );
    Ok(())
}

/// `fill<T>` by name expression, `VALUE` from `-D`, a source made at run time.
const FILL: &str = r#"
template <typename T>
__global__ void fill(T* x, long long n) {
    for (long long i = tb_index(); i < n; i += tb_stride()) x[i] = (T)(VALUE);
}
"#;

/// A `static` kernel with `const` options (a define, fast math): its defines reach NVRTC.
static STATIC_PUT: Kernel = Kernel::with_options(
    "extern \"C\" __global__ void put(float* x) { x[0] = (float)(VALUE); }",
    "put",
    CompileOptions::new()
        .defines(&[("VALUE", "3.25")])
        .fast_math(true),
);

#[test]
fn a_static_kernel_with_options_runs() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let s = ctx.new_stream()?;
    let f = STATIC_PUT.function(&s)?;
    let mut x = s.alloc_zeros::<f32>(1)?;
    // SAFETY: `put(float*)` writes one float.
    unsafe {
        s.launch_builder(&f)
            .arg(&mut x)
            .launch(LaunchConfig::for_num_elems(1))
    }?;
    ensure!(
        s.clone_dtoh(&x)? == [3.25],
        "the define did not reach NVRTC"
    );
    Ok(())
}

#[test]
fn templates_defines_and_generated_sources() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let s = ctx.new_stream()?;
    let options = CompileOptions::new().define("VALUE", "7.5");
    let n = 1000usize;
    let ff = kernel_with(&s, FILL, "fill<float>", &options)?;
    let fd = kernel_with(&s, FILL, "fill<double>", &options)?;
    let mut xf = s.alloc_zeros::<f32>(n)?;
    let mut xd = s.alloc_zeros::<f64>(n)?;
    let len = n as i64;
    // SAFETY: `fill<T>(T*, long long)` writes `n` elements, grid-stride.
    unsafe {
        s.launch_builder(&ff)
            .arg(&mut xf)
            .arg(&len)
            .launch(grid_stride(n as u64))
    }?;
    // SAFETY: as above.
    unsafe {
        s.launch_builder(&fd)
            .arg(&mut xd)
            .arg(&len)
            .launch(grid_stride(n as u64))
    }?;
    ensure!(s.clone_dtoh(&xf)?.iter().all(|v| *v == 7.5), "fill<float>");
    ensure!(s.clone_dtoh(&xd)?.iter().all(|v| *v == 7.5), "fill<double>");
    // A source generated per call: the cache is keyed by its contents, not its address.
    for value in [1, 2, 1] {
        let src = format!("extern \"C\" __global__ void put(int* x) {{ x[0] = {value}; }}");
        let f = kernel(&s, &src, "put")?;
        let mut x = s.alloc_zeros::<i32>(1)?;
        // SAFETY: `put(int*)` writes one int.
        unsafe {
            s.launch_builder(&f)
                .arg(&mut x)
                .launch(LaunchConfig::for_num_elems(1))
        }?;
        ensure!(s.clone_dtoh(&x)?[0] == value, "generated source {value}");
        drop(src); // its memory may be reused by the next source: the cache must not care
    }
    // Errors, not panics: a typo, an unknown name.
    let typo = kernel(&s, "extern \"C\" __global__ void k(flaot* x) {}", "k");
    ensure!(
        matches!(&typo, Err(tensorbridge_cudarc::Error::Compile { log, .. }) if log.contains("flaot")),
        "{typo:?}"
    );
    println!("{}", typo.unwrap_err());
    let unknown = kernel(&s, ARCH, "no_such_kernel");
    ensure!(unknown.is_err(), "an unknown kernel name was loaded");
    Ok(())
}

/// The cookbook's old kernel shape (`if (i < n)`, no loop), for the controls.
const ONES: &str = r#"
extern "C" __global__ void ones_looping(unsigned char* x, long long n) {
    for (long long i = tb_index(); i < n; i += tb_stride()) x[i] = 1;
}
extern "C" __global__ void ones_once(unsigned char* x, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) x[i] = 1;
}
"#;

#[test]
fn grid_stride_launches_cover_empty_tensors_and_more_than_2_32_elements() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let s = ctx.new_stream()?;
    let looping = kernel(&s, ONES, "ones_looping")?;
    let once = kernel(&s, ONES, "ones_once")?;
    // Empty: one block that does nothing, where a zero grid is refused.
    let mut empty = s.alloc_zeros::<u8>(1)?;
    let zero = 0i64;
    // SAFETY: writes nothing (`n` is 0).
    unsafe {
        s.launch_builder(&looping)
            .arg(&mut empty)
            .arg(&zero)
            .launch(grid_stride(0))
    }?;
    // SAFETY: as above.
    let refused = unsafe {
        s.launch_builder(&once)
            .arg(&mut empty)
            .arg(&zero)
            .launch(LaunchConfig::for_num_elems(0))
    };
    println!("for_num_elems(0): {refused:?}");
    ensure!(
        refused.is_err(),
        "the driver took a zero grid: the control proves nothing"
    );
    s.synchronize()?;
    // Past 2^32 elements: the last bytes are written; the control wraps and leaves them.
    let n: u64 = (1 << 32) + 64;
    let tail = |x: &cudarc::driver::CudaSlice<u8>| -> Result<Vec<u8>> {
        Ok(s.clone_dtoh(&x.slice((n as usize - 64)..))?)
    };
    let mut x = s.alloc_zeros::<u8>(n as usize)?;
    let len = n as i64;
    // SAFETY: writes `n` bytes of `x`, grid-stride.
    unsafe {
        s.launch_builder(&looping)
            .arg(&mut x)
            .arg(&len)
            .launch(grid_stride(n))
    }?;
    ensure!(
        tail(&x)?.iter().all(|b| *b == 1),
        "grid_stride left the tail unwritten"
    );
    drop(x);
    let mut y = s.alloc_zeros::<u8>(n as usize)?;
    // SAFETY: writes the bytes its grid covers, below `n`.
    unsafe {
        s.launch_builder(&once)
            .arg(&mut y)
            .arg(&len)
            .launch(LaunchConfig::for_num_elems(n as u32))
    }?;
    let wrapped = tail(&y)?.iter().filter(|b| **b == 0).count();
    println!("for_num_elems({n} as u32): {wrapped} of the last 64 bytes unwritten");
    ensure!(
        wrapped > 0,
        "the control covered the tail: the test proves nothing"
    );
    Ok(())
}

static ARCH_KERNEL: Kernel = Kernel::new(ARCH, "arch");

#[test]
fn cached_lookups_make_no_driver_call() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let s = ctx.new_stream()?;
    let first = Instant::now();
    let f = kernel(&s, ONES, "ones_looping")?;
    let compile = first.elapsed();
    const CALLS: u32 = 100_000;
    let time = |f: &dyn Fn() -> Result<()>| -> Result<f64> {
        for _ in 0..1000 {
            f()?;
        }
        let start = Instant::now();
        for _ in 0..CALLS {
            f()?;
        }
        Ok(start.elapsed().as_secs_f64() * 1e9 / f64::from(CALLS))
    };
    let by_source = time(&|| {
        drop(kernel(&s, ONES, "ones_looping")?);
        Ok(())
    })?;
    let by_static = time(&|| {
        drop(ARCH_KERNEL.function(&s)?);
        Ok(())
    })?;
    // What every call cost before functions were cached: the context saved and
    // `cuModuleGetFunction`.
    let module = ctx.load_module(tensorbridge_cudarc::ptx(ARCH, "arch")?)?;
    let get_function = time(&|| {
        let _keep = tensorbridge_cuda::ContextGuard::save()?;
        drop(module.load_function("arch")?);
        Ok(())
    })?;
    println!(
        "first kernel(): {compile:?}; cached kernel() {by_source:.0} ns, static Kernel \
         {by_static:.0} ns per call (before: ContextGuard + cuModuleGetFunction {get_function:.0} ns)"
    );
    drop(f);
    ensure!(
        by_source < 2000.0,
        "a cached kernel() lookup took {by_source:.0} ns"
    );
    ensure!(
        by_static < 1000.0,
        "a static Kernel lookup took {by_static:.0} ns"
    );
    Ok(())
}

/// Views of borrowed tensors hold no owner: the caller retires the call's owners with one
/// event (what `kernel_call` does), released after the kernel, with no further call.
#[test]
fn borrowed_arguments_are_retired_in_one_batch() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let s = ctx.new_stream()?;
    let counter = DropCounter::new();
    let (x, y) = (
        s.alloc_zeros::<f32>(1 << 10)?,
        s.alloc_zeros::<f32>(1 << 10)?,
    );
    let xt = tensorbridge_cudarc::import(x)?;
    let yt = tensorbridge_cudarc::import(y)?;
    let owners = [counter.owner(), counter.owner()];
    let spin = kernel(
        &s,
        r#"extern "C" __global__ void spin(const float* x, float* y, unsigned long long ns) {
            unsigned long long t0, t;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
            do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
            y[0] = x[0] + 1.0f;
        }"#,
        "spin",
    )?;
    {
        let args = KernelArgs::new(&s);
        // SAFETY: the owners below are retired on `s` after the launch (device-life).
        let xv = args.input::<f32>(unsafe { KernelTensor::borrowed(xt.as_ref()) })?;
        // SAFETY: as above.
        let mut yv = args.output::<f32>(unsafe { KernelTensor::borrowed(yt.as_ref()) })?;
        // Borrowed and owned arguments are checked against each other alike.
        let alias = args.output::<f32>(&yt);
        ensure!(
            alias.is_err(),
            "an output aliasing a borrowed one was accepted"
        );
        let ns: u64 = 200_000_000;
        // SAFETY: `spin(const float*, float*, u64)` reads x[0], writes y[0].
        unsafe {
            s.launch_builder(&spin)
                .arg(&xv)
                .arg(&mut yv)
                .arg(&ns)
                .launch(LaunchConfig::for_num_elems(1))
        }?;
    }
    tensorbridge_cuda::retire_all_on(&s, owners);
    ensure!(counter.drops() == 0, "released while the kernel runs");
    let took =
        tensorbridge_testkit::gpu::wait_until(Duration::from_secs(2), || counter.drops() == 2);
    let took = took.ok_or_else(|| anyhow::anyhow!("the batch was never released"))?;
    println!("batch of 2 released {took:?} after the call (kernel: 200 ms)");
    ensure!(
        took >= Duration::from_millis(190) && took <= Duration::from_millis(300),
        "released {took:?} after a 200 ms kernel"
    );
    drop((xt, yt));
    Ok(())
}
