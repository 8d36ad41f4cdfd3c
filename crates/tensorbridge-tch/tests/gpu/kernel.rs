//! Your own kernel on tch tensors: `tensorbridge_tch::import` for the arguments, `with_current_stream` for
//! libtorch's current stream as a cudarc stream, the cudarc adapter's `KernelArgs` for
//! checked views, the kernel compiled by `tensorbridge_cudarc::kernel`, libtorch reading the
//! result. The producer spins 100 ms on libtorch's stream before it writes `x`; the kernel
//! must see the written `x` (same stream) while the host never waits. The control launches
//! the same kernel on a stream of its own with nothing ordered, and reads stale values.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use tch::{Device as TchDevice, Kind};
use tensorbridge_cudarc::KernelArgs;
use tensorbridge_tch::with_current_stream;

use crate::{Affine, Kernels, context, serial, timing_event, torch_values};

const N: usize = 1 << 20;
const SPIN_NS: u64 = 100_000_000;
const HOST_LIMIT: Duration = Duration::from_millis(10);

const AXPY: &str = r#"
extern "C" __global__ void axpy(float alpha, const float* x, tb_layout lx,
                                float* y, tb_layout ly, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[tb_offset(ly, i)] += alpha * x[tb_offset(lx, i)];
}
"#;

/// `y += alpha * x` on `stream` through checked views.
fn axpy(
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    alpha: f32,
    x: &tensorbridge_core::Tensor,
    y: &tensorbridge_core::Tensor,
) -> Result<(), tensorbridge_cudarc::Error> {
    let args = KernelArgs::new(stream);
    let xv = args.input::<f32>(x)?;
    let mut yv = args.output::<f32>(y)?;
    let n = yv.numel() as i64;
    let f = tensorbridge_cudarc::kernel(stream, AXPY, "axpy")?;
    let (lx, ly) = (xv.layout()?, yv.layout()?);
    // SAFETY: `axpy(float, const float*, tb_layout, float*, tb_layout, long long)` touches the
    // views' elements only (`tb_offset` for `i < n`), on the views' stream.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&alpha)
            .arg(&xv)
            .arg(&lx)
            .arg(&mut yv)
            .arg(&ly)
            .arg(&n)
            .launch(LaunchConfig::for_num_elems(n as u32))
    }?;
    Ok(())
}

/// How many of `y` hold what `y = 1 + 2 * x` gives after the producer wrote x[i] = 2 i + 1.
fn right_after_axpy(y: &[f32]) -> usize {
    y.iter()
        .enumerate()
        .filter(|(i, v)| **v == 1.0 + 2.0 * (2.0 * *i as f32 + 1.0))
        .count()
}

#[test]
fn kernel_on_libtorchs_stream_after_a_busy_producer() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let dev = TchDevice::Cuda(0);
    let x = tch::Tensor::zeros([N as i64], (Kind::Float, dev));
    let y = tch::Tensor::ones([N as i64], (Kind::Float, dev));
    let (xt, yt) = (crate::import(&x)?, crate::import(&y)?);
    with_current_stream(0, |s| axpy(s, 0.0, &xt, &yt))??; // compile and load once
    tch::Cuda::synchronize(0);

    // libtorch's current stream (the legacy default stream): busy, then x[i] = 2 i + 1.
    let torch_stream = ctx.default_stream();
    Affine::fill(xt.data_ptr() as u64, N, 2.0, 1.0)
        .after(SPIN_NS)
        .launch(&k, &torch_stream)?;
    let p_end = timing_event(&torch_stream)?;
    let t0 = Instant::now();
    with_current_stream(0, |s| axpy(s, 2.0, &xt, &yt))??;
    let host = t0.elapsed();
    let busy = !p_end.is_complete();
    let got = torch_values(&y); // libtorch reads y on its stream
    ensure!(
        busy,
        "the producer finished before the call returned: the host waited"
    );
    ensure!(host < HOST_LIMIT, "the call kept the host {host:?}");
    let bad = N - right_after_axpy(&got);
    ensure!(bad == 0, "{bad} of {N} values wrong");
    Ok(())
}

#[test]
fn control_the_same_kernel_unordered_reads_stale_values() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let dev = TchDevice::Cuda(0);
    let x = tch::Tensor::zeros([N as i64], (Kind::Float, dev));
    let y = tch::Tensor::ones([N as i64], (Kind::Float, dev));
    let (xt, yt) = (crate::import(&x)?, crate::import(&y)?);
    // A non-blocking stream of its own, and x's readiness withheld: nothing orders it. Made
    // before the producer runs: cudarc's first `new_stream` of a context synchronises the
    // context, which would wait for the producer and hide the race.
    let own = ctx.new_stream()?;
    tch::Cuda::synchronize(0);
    Affine::fill(xt.data_ptr() as u64, N, 2.0, 1.0)
        .after(SPIN_NS)
        .launch(&k, &ctx.default_stream())?;
    // SAFETY: `Ready::Now` is a lie on purpose (the control); the memory stays alive until
    // the synchronisations below.
    let x_now = unsafe { xt.clone().with_ready(tensorbridge_core::Ready::Now) };
    // SAFETY: as above (y's readiness names the busy stream too).
    let y_now = unsafe { yt.clone().with_ready(tensorbridge_core::Ready::Now) };
    axpy(&own, 2.0, &x_now, &y_now)?;
    own.synchronize()?;
    let got = torch_values(&y);
    let right = right_after_axpy(&got);
    ensure!(
        right < N,
        "the unordered control got every value right: no race to observe"
    );
    Ok(())
}

#[test]
fn aliasing_outputs_and_transposed_inputs() -> Result<()> {
    let _serial = serial();
    let _ctx = context(0)?;
    let dev = TchDevice::Cuda(0);
    let x = tch::Tensor::arange(12, (Kind::Float, dev)).reshape([3, 4]);
    let y = tch::Tensor::zeros([4, 3], (Kind::Float, dev)).tr(); // strides (1, 3)
    let (xt, yt) = (crate::import(&x)?, crate::import(&y)?);
    with_current_stream(0, |s| axpy(s, 1.0, &xt, &yt))??;
    ensure!(
        torch_values(&y.contiguous()) == torch_values(&x),
        "transposed output wrong"
    );

    let err = with_current_stream(0, |s| axpy(s, 1.0, &xt, &xt))?.unwrap_err();
    ensure!(
        matches!(
            err,
            tensorbridge_cudarc::Error::Core(tensorbridge_core::Error::Aliased { .. })
        ),
        "{err:?}"
    );
    let b = crate::import(&tch::Tensor::zeros([1, 4], (Kind::Float, dev)).expand([3, 4], false))?;
    let err = with_current_stream(0, |s| axpy(s, 1.0, &xt, &b))?.unwrap_err();
    ensure!(
        matches!(
            err,
            tensorbridge_cudarc::Error::Core(tensorbridge_core::Error::SelfOverlap { .. })
        ),
        "{err:?}"
    );
    Ok(())
}

/// libtorch's default stream lives for the process: `with_current_stream` lends it as it is
/// (the same handle, no fork), where an external stream would get a stream of the CUDA layer
/// (`StreamLife::CallOnly`, tested with raw streams in tensorbridge-cuda's GPU suite; the id
/// rule that tells them apart is a unit test of this crate).
#[test]
fn libtorchs_own_current_stream_is_lent_as_it_is() -> Result<()> {
    let _serial = serial();
    let _ctx = context(0)?;
    let _ = tch::Tensor::zeros([1], (Kind::Float, TchDevice::Cuda(0))); // libtorch's CUDA up
    let lent = with_current_stream(0, |s| s.cu_stream() as usize)?;
    ensure!(lent == 0, "the default stream was lent as {lent:#x}");
    Ok(())
}
