//! A stream another library owns, borrowed as a cudarc stream: kernels launched through
//! `KernelArgs` on it, aliasing refused, and the keeper held while a clone of the wrapper
//! escapes the scope.

use anyhow::Result;
use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};
use std::sync::Arc;
use tensorbridge_cudarc::{KernelArgs, import};
use tensorbridge_testkit::DropCounter;

use crate::{context, serial};

const SCALE: &str = r#"
extern "C" __global__ void scale(float a, const float* x, tb_layout lx, float* y, tb_layout ly,
                                 long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[tb_offset(ly, i)] = a * x[tb_offset(lx, i)];
}
"#;

#[test]
fn escaped_wrappers_keep_the_streams_keeper() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let owned = ctx.new_stream()?; // "another library's" stream
    let handle = tensorbridge_cuda::stream_of(&owned);
    let counter = DropCounter::new();
    let mut escaped: Option<Arc<CudaStream>> = None;
    // SAFETY: `owned` is live and held by the keeper below as long as the keeper lives.
    unsafe {
        tensorbridge_cuda::with_stream_raw(
            0,
            handle,
            Some(counter.owner_with(owned.clone())),
            |s| escaped = Some(s.clone()),
        )
    }?;
    drop(owned);
    tensorbridge_cuda::reclaim();
    assert_eq!(
        counter.drops(),
        0,
        "keeper released while a wrapper escaped"
    );
    let escaped = escaped.expect("set in the scope");
    escaped.synchronize()?; // still a live stream
    drop(escaped);
    tensorbridge_cuda::reclaim();
    assert_eq!(
        counter.drops(),
        1,
        "keeper not released after the last wrapper"
    );
    Ok(())
}

#[test]
fn kernel_args_on_a_borrowed_stream() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let producer = ctx.new_stream()?;
    let x = import(producer.clone_htod(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])?)?;
    let y = import(producer.alloc_zeros::<f32>(6)?)?;
    let owned = ctx.new_stream()?;
    let body = |s: &Arc<CudaStream>| -> Result<(), tensorbridge_cudarc::Error> {
        let args = KernelArgs::new(s);
        let xv = args.input::<f32>(&x)?;
        let mut yv = args.output::<f32>(&y)?;
        assert!(
            args.output::<f32>(&x).is_err(),
            "x is an input: writing it aliases"
        );
        let f = tensorbridge_cudarc::kernel(s, SCALE, "scale")?;
        let (lx, ly, n) = (xv.layout()?, yv.layout()?, 6i64);
        // SAFETY: `scale`'s signature, 6 elements each, on the views' stream.
        unsafe {
            s.launch_builder(&f)
                .arg(&2.0f32)
                .arg(&xv)
                .arg(&lx)
                .arg(&mut yv)
                .arg(&ly)
                .arg(&n)
                .launch(LaunchConfig::for_num_elems(6))
        }?;
        Ok(())
    };
    // SAFETY: `owned` outlives the call and nothing escapes.
    let got = unsafe {
        tensorbridge_cuda::with_stream_raw(0, tensorbridge_cuda::stream_of(&owned), None, body)
    }?;
    got?;
    owned.synchronize()?;
    let back =
        tensorbridge_cudarc::try_into_slice::<f32>(y).map_err(|_| anyhow::anyhow!("held"))?;
    assert_eq!(owned.clone_dtoh(&back)?, [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]);
    Ok(())
}
