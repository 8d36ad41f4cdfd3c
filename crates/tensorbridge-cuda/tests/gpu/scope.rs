//! A foreign stream that lives for the call only (`StreamLife::CallOnly`: PyTorch's
//! `ExternalStream`, a libtorch external stream): the closure runs on a stream of the layer,
//! forked from the caller's and joined back, so work is ordered as on the caller's stream
//! (a busy producer before, a reader after; the control without the fork reads stale data),
//! an escaped clone never names the caller's stream and stays usable after that stream is
//! destroyed, and a capture on the caller's stream records the closure's work.

use std::ptr::null_mut;
use std::sync::Arc;

use anyhow::{Result, ensure};
use cudarc::driver::{CudaContext, CudaStream, sys};
use tensorbridge_cuda::StreamLife;

use crate::{Affine, Kernels, affine, assert_exact, context, dptr, serial};

const N: usize = 1 << 20;
const SPIN_NS: u64 = 100_000_000;

/// A stream "another library" made (`cuStreamCreate`), destroyed by [`External::destroy`]:
/// what `torch.cuda.ExternalStream(cupy_stream.ptr)` names.
struct External {
    raw: sys::CUstream,
    /// A wrapper for the test's own launches on it (cudarc does not destroy it).
    wrapper: Arc<CudaStream>,
}

impl External {
    fn new(ctx: &Arc<CudaContext>) -> Result<External> {
        let _keep = tensorbridge_cuda::ContextGuard::save()?;
        ctx.bind_to_thread()?;
        let mut raw = null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: a context is current; one handle written to a live local.
        let rc = unsafe { sys::cuStreamCreate(&mut raw, flags) };
        ensure!(rc == sys::CUresult::CUDA_SUCCESS, "cuStreamCreate: {rc:?}");
        // SAFETY: a live stream of `ctx`, destroyed only by `destroy`, after the wrapper.
        let wrapper = unsafe { ctx.wrap_borrowed_stream(raw) };
        Ok(External { raw, wrapper })
    }

    fn name(&self) -> tensorbridge_core::Stream {
        tensorbridge_cuda::stream_from_raw(self.raw)
    }

    /// Waits for its work and destroys it, as its owner would.
    fn destroy(self) -> Result<()> {
        self.wrapper.synchronize()?;
        drop(self.wrapper);
        // SAFETY: made in `new`, destroyed once; no wrapper of the test names it any more.
        let rc = unsafe { sys::cuStreamDestroy_v2(self.raw) };
        ensure!(rc == sys::CUresult::CUDA_SUCCESS, "cuStreamDestroy: {rc:?}");
        Ok(())
    }
}

#[test]
fn call_only_streams_are_forked_joined_and_never_lent() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let expected = affine(N, 2.0, 1.0);
    let mut outcomes = Vec::new();
    for forked in [true, false] {
        let ext = External::new(&ctx)?;
        let x = ext.wrapper.clone_htod(&vec![0.0f32; N])?;
        let y = ext.wrapper.clone_htod(&vec![-1.0f32; N])?;
        let z = ext.wrapper.clone_htod(&vec![-1.0f32; N])?;
        let (xp, yp, zp) = (dptr(&x), dptr(&y), dptr(&z));
        let mut unordered = if forked {
            None
        } else {
            Some(ctx.new_stream()?)
        };
        ext.wrapper.synchronize()?;
        // The caller's work on its stream: busy, then writes x.
        Affine::fill(xp, N, 2.0, 1.0)
            .after(SPIN_NS)
            .launch(&k, &ext.wrapper)?;
        let mut escaped: Option<Arc<CudaStream>> = None;
        if forked {
            // SAFETY: `ext` is live for the call (destroyed only at the end of the loop).
            unsafe {
                tensorbridge_cuda::with_stream_raw(0, ext.name(), StreamLife::CallOnly, |s| {
                    escaped = Some(s.clone());
                    // y = x on the lent stream: must see the caller's x.
                    Affine::copy(xp, yp, N).launch(&k, s)
                })
            }??;
        } else {
            // The control: the same copy on a stream nothing ordered (made before the
            // producer's work: cudarc synchronises the context when it makes a stream, which
            // would hide the race).
            let unordered = unordered.take().expect("made above");
            Affine::copy(xp, yp, N).launch(&k, &unordered)?;
            escaped = Some(unordered);
        }
        // The caller's later work on its stream: z = y, must see the copy.
        Affine::copy(yp, zp, N).launch(&k, &ext.wrapper)?;
        let escaped = escaped.expect("the closure ran");
        ensure!(
            escaped.cu_stream() != ext.raw,
            "the lent stream is the caller's"
        );
        ext.wrapper.synchronize()?;
        let got = ext.wrapper.clone_dtoh(&z)?;
        let wrong = got
            .iter()
            .zip(&expected)
            .filter(|(g, e)| g.to_bits() != e.to_bits())
            .count();
        outcomes.push(wrong);
        drop((x, y, z));
        ext.destroy()?;
        // The escaped clone outlives the caller's stream: still a stream, usable.
        let w = escaped.clone_htod(&vec![0.0f32; 16])?;
        Affine::fill(dptr(&w), 16, 1.0, 0.0).launch(&k, &escaped)?;
        escaped.synchronize()?;
        assert_exact(
            &escaped.clone_dtoh(&w)?,
            &affine(16, 1.0, 0.0),
            "escaped clone",
        );
    }
    println!(
        "call only: {} wrong; unordered control: {} wrong",
        outcomes[0], outcomes[1]
    );
    ensure!(
        outcomes[0] == 0,
        "{} elements wrong through the fork and join",
        outcomes[0]
    );
    ensure!(
        outcomes[1] > 0,
        "the control did not race: the test proves nothing"
    );
    Ok(())
}

#[test]
fn immortal_and_kept_streams_are_lent_as_they_are() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let ext = External::new(&ctx)?;
    let mut lent = [null_mut(); 2];
    for (i, life) in [StreamLife::Immortal, StreamLife::KeptBy(Arc::new(()))]
        .into_iter()
        .enumerate()
    {
        // SAFETY: `ext` lives until the end of the test, past every clone.
        lent[i] =
            unsafe { tensorbridge_cuda::with_stream_raw(0, ext.name(), life, |s| s.cu_stream()) }?;
    }
    ensure!(lent == [ext.raw; 2], "{lent:?} vs {:?}", ext.raw);
    // Call-only: calls in a row reuse the layer's streams (a join's event may hold its
    // stream a moment, so a few may be in use, never one per call); one whose clone escaped
    // is not lent again while the clone lives.
    let call_only = || {
        // SAFETY: as above.
        unsafe {
            tensorbridge_cuda::with_stream_raw(0, ext.name(), StreamLife::CallOnly, |s| s.clone())
        }
    };
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..32 {
        let s = call_only()?;
        seen.insert(s.cu_stream() as usize);
        drop(s);
        tensorbridge_cuda::reclaim();
    }
    ensure!(
        seen.len() <= 4,
        "32 calls in a row used {} of the layer's streams: they are not reused",
        seen.len()
    );
    let kept = call_only()?;
    for _ in 0..32 {
        let s = call_only()?;
        ensure!(
            s.cu_stream() != kept.cu_stream(),
            "a stream whose clone escaped was lent again"
        );
    }
    drop(kept);
    tensorbridge_cuda::reclaim();
    ext.destroy()?;
    Ok(())
}

#[test]
fn call_only_inside_a_capture_records_the_closures_work() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let ext = External::new(&ctx)?;
    let x = ext.wrapper.clone_htod(&vec![0.0f32; N])?;
    let y = ext.wrapper.clone_htod(&vec![0.0f32; N])?;
    let (xp, yp) = (dptr(&x), dptr(&y));
    ext.wrapper.synchronize()?;
    let relaxed = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    ext.wrapper.begin_capture(relaxed)?;
    Affine::fill(xp, N, 2.0, 1.0).launch(&k, &ext.wrapper)?;
    // SAFETY: `ext` is live for the call.
    unsafe {
        tensorbridge_cuda::with_stream_raw(0, ext.name(), StreamLife::CallOnly, |s| {
            Affine::copy(xp, yp, N).launch(&k, s)
        })
    }??;
    let status = tensorbridge_cuda::capture_status(&ext.wrapper)?;
    ensure!(
        matches!(status, tensorbridge_cuda::CaptureStatus::Active { .. }),
        "the capture was invalidated: {status:?}"
    );
    // SAFETY: zero is the default flag set.
    let flags = unsafe { std::mem::transmute::<u32, sys::CUgraphInstantiate_flags>(0) };
    let graph = ext
        .wrapper
        .end_capture(flags)?
        .ok_or_else(|| anyhow::anyhow!("the capture made no graph (unjoined work?)"))?;
    for replay in 0..10 {
        Affine::fill(yp, N, 0.0, -1.0).launch(&k, &ext.wrapper)?;
        graph.launch()?;
        ext.wrapper.synchronize()?;
        assert_exact(
            &ext.wrapper.clone_dtoh(&y)?,
            &affine(N, 2.0, 1.0),
            &format!("replay {replay}"),
        );
    }
    drop((graph, x, y));
    ext.destroy()?;
    Ok(())
}
