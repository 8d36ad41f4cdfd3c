//! The layer's copies (what the Python crate's `__dlpack__(copy=True)` and
//! `dl_device=(1, 0)` use): device memory of its own, and a tensor's bytes copied out after
//! its readiness. A producer busy for 100 ms writes the source; the copies see its writes,
//! while the control (the same copy with no readiness to wait for) reads stale bytes.

use anyhow::{Result, ensure};
use tensorbridge_core::{Ready, Stream};
use tensorbridge_cuda::copy::{DeviceBuffer, on_device, to_host};

use crate::{Affine, Kernels, affine, context, serial, tensor_over};

const N: usize = 1 << 20;
const SPIN_NS: u64 = 100_000_000;

/// The floats of `buffer`, read back with the driver's own synchronous copy.
fn read_back(
    ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
    buffer: &DeviceBuffer,
) -> Result<Vec<f32>> {
    let mut out = vec![0.0f32; buffer.len() / 4];
    let _keep = tensorbridge_cuda::ContextGuard::save()?;
    ctx.bind_to_thread()?;
    // SAFETY: a context is current; `buffer` holds `len` bytes of device memory, `out` as
    // many bytes of host memory.
    let rc = unsafe {
        cudarc::driver::sys::cuMemcpyDtoH_v2(
            out.as_mut_ptr().cast(),
            buffer.addr() as cudarc::driver::sys::CUdeviceptr,
            buffer.len(),
        )
    };
    ensure!(
        rc == cudarc::driver::sys::CUresult::CUDA_SUCCESS,
        "cuMemcpyDtoH: {rc:?}"
    );
    Ok(out)
}

#[test]
fn copies_wait_for_the_tensors_producer() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let producer = ctx.new_stream()?;
    let consumer = ctx.new_stream()?;
    let expected = affine(N, 2.0, 1.0);
    let mut wrong = Vec::new();
    for ordered in [true, false] {
        let t = tensor_over(producer.clone_htod(&vec![0.0f32; N])?, &producer)?;
        producer.synchronize()?;
        Affine::fill(t.data_ptr() as u64, N, 2.0, 1.0)
            .after(SPIN_NS)
            .launch(&k, &producer)?;
        let t = if ordered {
            t
        } else {
            // SAFETY: the control lies about readiness on purpose: nothing reads the bytes
            // on the host (the copies go through the driver into memory of the test's own).
            unsafe { t.with_ready(Ready::Now) }
        };
        // Device to device, on the consumer's stream, no host wait.
        let buffer = DeviceBuffer::alloc(0, N * 4)?;
        // SAFETY: the tensor's whole span into a buffer of its size; `consumer` is live.
        unsafe {
            on_device(
                &t,
                t.data_ptr(),
                &buffer,
                tensorbridge_cuda::stream_of(&consumer),
                false,
            )
        }?;
        consumer.synchronize()?;
        let via_device = read_back(&ctx, &buffer)?;
        // Device to host, on the legacy stream after the readiness, the host waiting.
        let mut host = vec![0.0f32; N];
        // SAFETY: the tensor's whole span into a host vector of its size.
        unsafe { to_host(&t, t.data_ptr(), host.as_mut_ptr().cast(), N * 4) }?;
        let bad = |v: &[f32]| {
            v.iter()
                .zip(&expected)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count()
        };
        wrong.push((bad(&via_device), bad(&host)));
        producer.synchronize()?;
    }
    println!(
        "copies after the readiness: {:?}; control: {:?}",
        wrong[0], wrong[1]
    );
    ensure!(
        wrong[0] == (0, 0),
        "ordered copies read stale bytes: {:?}",
        wrong[0]
    );
    ensure!(
        wrong[1].0 > 0,
        "the control's device copy did not race: the test proves nothing"
    );
    Ok(())
}

#[test]
fn device_buffers_come_and_go() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let (free_before, _) = cudarc::driver::result::mem_get_info()?;
    for _ in 0..100 {
        let b = DeviceBuffer::alloc(0, 64 << 20)?;
        ensure!(
            b.addr() != 0 && b.len() == 64 << 20 && b.ordinal() == 0,
            "{b:?}"
        );
        let info = tensorbridge_cuda::inspect(b.addr())?;
        ensure!(info.base == b.addr() && info.size >= b.len(), "{info:?}");
    }
    let empty = DeviceBuffer::alloc(0, 0)?;
    ensure!(empty.addr() == 0 && empty.is_empty(), "{empty:?}");
    let (free_after, _) = cudarc::driver::result::mem_get_info()?;
    ensure!(
        free_before.abs_diff(free_after) <= 2 << 20,
        "device memory moved by {} bytes over 100 buffers of 64 MiB",
        free_before.abs_diff(free_after)
    );
    // The stream a copy runs on may be a raw default stream too.
    let t = tensor_over(
        ctx.default_stream().clone_htod(&[1.0f32; 4])?,
        &ctx.default_stream(),
    )?;
    let b = DeviceBuffer::alloc(0, 16)?;
    // SAFETY: the span into a buffer of its size; the legacy stream is live; host waits.
    unsafe { on_device(&t, t.data_ptr(), &b, Stream::LegacyDefault, true) }?;
    Ok(())
}
