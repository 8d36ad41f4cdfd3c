//! CUDA graph capture and the cudarc adapter (the layer's own capture rules are tested in
//! tensorbridge-cuda's GPU suite).

use anyhow::Result;
use cudarc::driver::sys;
use tensorbridge_cuda::CaptureStatus;

use crate::{context, serial};

fn global() -> sys::CUstreamCaptureMode {
    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL
}

fn instantiate_flags() -> sys::CUgraphInstantiate_flags {
    // SAFETY: zero is the default flag set (no bits).
    unsafe { std::mem::transmute::<u32, sys::CUgraphInstantiate_flags>(0) }
}

/// A lent buffer's borrow ends with its scope, before any replay: views of it on a capturing
/// stream are refused, and the capture stays valid.
#[test]
fn lent_buffers_are_refused_to_a_capture() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let s = ctx.new_stream()?;
    let home = ctx.new_stream()?;
    let mut x = home.clone_htod(&vec![1.0f32; 256])?;
    s.begin_capture(global())?;
    let refused = tensorbridge_cudarc::lend(&mut x, |lent| {
        let view = lent.view(&s).map(drop);
        let view_mut = lent.view_mut(&s).map(drop);
        Ok::<_, tensorbridge_cudarc::Error>((view, view_mut))
    })?;
    for r in [refused.0, refused.1] {
        assert!(
            matches!(r, Err(tensorbridge_cudarc::Error::LentToCapture { .. })),
            "{r:?}"
        );
    }
    let status = tensorbridge_cuda::capture_status(&s)?;
    assert!(matches!(status, CaptureStatus::Active { .. }), "{status:?}");
    let graph = s.end_capture(instantiate_flags())?;
    drop(graph);
    Ok(())
}
