//! The GPU is there and works: a device report, exact copies through cudarc, and the core's
//! view of a device buffer it does not own.

use std::sync::Arc;

use anyhow::{Context as _, Result, ensure};
use cudarc::driver::{CudaContext, CudaSlice, DevicePtr as _, sys};
use tensorbridge_core::{DType, Device, Error, Owner, RawTensor, Tensor};
use tensorbridge_integration::f32_pattern;

/// Elements per test buffer: 4 MiB of `f32`.
const N: usize = 1 << 20;

/// A context on device 0. Checks for libcuda first: without it cudarc panics on first use
/// with a message that does not say a GPU was expected.
fn context() -> Result<Arc<CudaContext>> {
    // The CUDA layer's check, which asks the dynamic loader: cudarc's `is_culib_present`
    // exists only when cudarc loads libcuda, not when a build links it.
    ensure!(
        tensorbridge_cuda::driver_present(),
        "libcuda not found: the gpu-tests feature expects an NVIDIA GPU and driver \
         (LD_LIBRARY_PATH={:?})",
        std::env::var("LD_LIBRARY_PATH").unwrap_or_default()
    );
    CudaContext::new(0).context("creating a CUDA context on device 0")
}

/// The driver's CUDA version as `major * 1000 + minor * 10` (13000 for CUDA 13.0).
fn driver_version() -> Result<i32> {
    let mut version = 0;
    // SAFETY: libcuda is loaded (`context` was called first); `cuDriverGetVersion` writes one
    // `int` through a pointer to a live local and keeps no reference to it.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .context("cuDriverGetVersion")?;
    Ok(version)
}

/// Compares bit for bit and names the first element that differs (not a 1M-element dump).
fn check_exact(found: &[f32], expected: &[f32], what: &str) -> Result<()> {
    ensure!(
        found.len() == expected.len(),
        "{what}: {} elements but {} were expected",
        found.len(),
        expected.len()
    );
    if let Some(i) = (0..found.len()).find(|&i| found[i].to_bits() != expected[i].to_bits()) {
        anyhow::bail!(
            "{what}: element {i} is {} but {} was expected",
            found[i],
            expected[i]
        );
    }
    Ok(())
}

#[test]
fn device_report() -> Result<()> {
    let ctx = context()?;
    let (major, minor) = ctx.compute_capability()?;
    let total = ctx.total_mem()?;
    let driver = driver_version()?;
    println!("CUDA devices: {}", CudaContext::device_count()?);
    println!("device 0: {}", ctx.name()?);
    println!("compute capability: {major}.{minor}");
    println!(
        "total memory: {:.1} GiB",
        total as f64 / f64::from(1u32 << 30)
    );
    println!(
        "driver supports CUDA {}.{} ({driver})",
        driver / 1000,
        driver % 1000 / 10
    );
    // cudarc is built with CUDA 13.0 bindings (`cuda-13000`); an older driver lacks symbols.
    ensure!(
        driver >= 13_000,
        "driver supports CUDA {driver}, but cudarc is built for 13000 (CUDA 13.0)"
    );
    ensure!(total > 0, "device 0 reports no memory");
    Ok(())
}

#[test]
fn copies_roundtrip_exactly() -> Result<()> {
    let ctx = context()?;
    let stream = ctx.default_stream();
    let host = f32_pattern(N);
    let first = stream.clone_htod(&host)?;
    let mut second = stream.alloc_zeros::<f32>(N)?;
    stream.memcpy_dtod(&first, &mut second)?;
    let back_first = stream.clone_dtoh(&first)?;
    let back_second = stream.clone_dtoh(&second)?;
    stream.synchronize()?;
    check_exact(&back_first, &host, "host -> device -> host")?;
    check_exact(&back_second, &host, "host -> device -> device -> host")
}

#[test]
fn core_describes_a_device_buffer() -> Result<()> {
    let ctx = context()?;
    let stream = ctx.default_stream();
    let host = f32_pattern(N);
    let buffer: Arc<CudaSlice<f32>> = Arc::new(stream.clone_htod(&host)?);
    let ptr = {
        let (ptr, _record) = buffer.device_ptr(&stream);
        usize::try_from(ptr)?
    };

    let shape = [i64::try_from(N)?];
    let raw = RawTensor {
        device_type: 2, // kDLCUDA
        device_id: 0,
        ..RawTensor::host(ptr, DType::FLOAT32, &shape)
    };
    let desc = raw.validate()?;
    ensure!(desc.device() == Device::cuda(0), "device {}", desc.device());
    ensure!(
        desc.byte_span() == (ptr..ptr + 4 * N),
        "byte span {:#x?} of a buffer at {ptr:#x}",
        desc.byte_span()
    );
    ensure!(desc.nbytes() == 4 * N as u64, "nbytes {}", desc.nbytes());

    let owner: Owner = buffer.clone();
    // SAFETY:
    // - obligation 1: the span is exactly `buffer`'s allocation on device 0 (asserted just
    //   above), which `owner` (a clone of the `Arc` around the `CudaSlice`) keeps allocated
    //   and writable until its last clone drops;
    // - obligation 2: device memory admits no host view, and nothing writes `buffer` while
    //   the tensor lives (the only later use is a device -> host copy that reads it).
    let tensor = unsafe { Tensor::from_descriptor(desc, owner) };
    ensure!(
        tensor.data_ptr() == ptr,
        "data_ptr {:#x}",
        tensor.data_ptr()
    );
    let refused = tensor.host_view::<f32>().err();
    ensure!(
        matches!(refused, Some(Error::NotHostAccessible { device }) if device == Device::cuda(0)),
        "a host view of device memory gave {refused:?}"
    );

    // The tensor alone keeps the buffer alive, contents intact; dropping it frees the buffer.
    let weak = Arc::downgrade(&buffer);
    drop(buffer);
    let kept = tensor
        .owner()
        .downcast_ref::<CudaSlice<f32>>()
        .context("the owner is the CudaSlice")?;
    let back = stream.clone_dtoh(kept)?;
    stream.synchronize()?;
    check_exact(&back, &host, "read through the tensor's owner")?;
    drop(tensor);
    ensure!(
        weak.upgrade().is_none(),
        "dropping the tensor did not release the buffer"
    );
    Ok(())
}
