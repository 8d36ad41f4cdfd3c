//! CUDA graph capture: every hand-off is legal inside a capture. Inside one capture the
//! ordering becomes graph edges and the graph replays with right results; a producer outside
//! the capture is waited for by the graph (and the control without the hand-off reads stale
//! data); what the driver forbids is refused with an error and leaves the capture valid;
//! owners retired during a capture live as long as the graph.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use cudarc::driver::{CudaContext, CudaStream, sys};
use tensorbridge_core::{Access, DType, Descriptor, Device, Layout, Packing, Ready, Tensor};
use tensorbridge_cuda::{CaptureStatus, Error};
use tensorbridge_testkit::DropCounter;

use crate::{Affine, Kernels, affine, assert_exact, context, dptr, serial, wait_until};

const N: usize = 1 << 20;
/// Long enough that a graph launched right after the producer reads stale data unless it
/// waits.
const SPIN_NS: u64 = 100_000_000;

/// A tensor over `ptr` (N floats on device 0) whose data is ready on `stream`.
///
/// # Safety
/// `ptr` holds N floats that outlive the tensor; `stream` is live while it does.
unsafe fn tensor_on(
    ptr: u64,
    stream: &CudaStream,
    owner: tensorbridge_core::Owner,
) -> Result<Tensor> {
    let desc = Descriptor::new(
        ptr as usize,
        Device::cuda(0),
        DType::FLOAT32,
        Packing::Packed,
        Layout::row_major(&[N as i64])?,
        Access::ReadWrite,
    )?;
    // SAFETY: the caller's promise.
    let t = unsafe { Tensor::from_descriptor(desc, owner) };
    // SAFETY: the data's writers are enqueued on `stream`, which the caller keeps alive; not
    // the per-thread default stream.
    Ok(unsafe { t.with_ready(Ready::Stream(tensorbridge_cuda::stream_of(stream))) })
}

fn global() -> sys::CUstreamCaptureMode {
    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL
}

fn instantiate_flags() -> sys::CUgraphInstantiate_flags {
    // SAFETY: zero is the default flag set (no bits).
    unsafe { std::mem::transmute::<u32, sys::CUgraphInstantiate_flags>(0) }
}

#[test]
fn handoffs_inside_a_capture_become_graph_edges_and_replay_right() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let s = ctx.new_stream()?;
    let t_side = ctx.new_stream()?;
    let x = s.clone_htod(&vec![0.0f32; N])?;
    let y = s.clone_htod(&vec![0.0f32; N])?;
    let (xp, yp) = (dptr(&x), dptr(&y));
    ctx.synchronize()?;

    s.begin_capture(global())?;
    // The producer writes inside the capture; its readiness is a signal recorded in it.
    Affine::fill(xp, N, 2.0, 1.0).launch(&k, &s)?;
    // SAFETY: `x` outlives the tensor (both dropped at the end); `s` is held.
    let t = unsafe { tensor_on(xp, &s, Arc::new(())) }?;
    let signal = tensorbridge_cuda::record_ready(&t)?;
    let captured = tensorbridge_cuda::capture_status(&s)?;
    assert!(
        matches!(captured, CaptureStatus::Active { .. }),
        "{captured:?}"
    );
    // A consumer stream outside the capture may not wait on it: refused, capture kept.
    let outside = ctx.new_stream()?;
    let refused = tensorbridge_cuda::make_ready_on(&signal, &outside);
    assert!(
        matches!(refused, Err(Error::CaptureMismatch { .. })),
        "{refused:?}"
    );
    // SAFETY: the legacy default stream is always live.
    let legacy = unsafe {
        tensorbridge_cuda::make_ready_on_raw(&signal, tensorbridge_core::Stream::LegacyDefault)
    };
    assert!(
        legacy.is_err(),
        "legacy consumer of a captured signal: {legacy:?}"
    );
    // Fork a side stream into the capture, hand the tensor to it, copy there, join back.
    tensorbridge_cuda::join(&t_side, &s)?;
    tensorbridge_cuda::make_ready_on(&signal, &t_side)?;
    let handed = tensorbridge_cuda::handoff(&signal, &t_side)?;
    Affine::copy(xp, yp, N).launch(&k, &t_side)?;
    tensorbridge_cuda::join(&s, &t_side)?;
    // Host waits are refused inside the capture.
    let host = tensorbridge_cuda::synchronize(&handed);
    assert!(
        matches!(host, Err(Error::HostWaitInCapture { .. })),
        "{host:?}"
    );
    drop((handed, signal, t));
    let graph = s
        .end_capture(instantiate_flags())?
        .ok_or_else(|| anyhow::anyhow!("the capture made no graph"))?;
    let expected = affine(N, 2.0, 1.0);
    for replay in 0..100 {
        Affine::fill(yp, N, 0.0, -1.0).launch(&k, &s)?;
        Affine::fill(xp, N, 0.0, -2.0).launch(&k, &s)?;
        graph.launch()?;
        s.synchronize()?;
        let got = s.clone_dtoh(&y)?;
        assert_exact(&got, &expected, &format!("replay {replay}"));
    }
    println!("100 replays right");
    Ok(())
}

/// The graph waits, at replay, for a producer outside the capture (an event-wait node);
/// the control without the hand-off reads the data before the producer wrote it.
#[test]
fn a_graph_waits_for_a_producer_outside_its_capture() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let u = ctx.new_stream()?;
    let s = ctx.new_stream()?;
    let x = u.clone_htod(&vec![0.0f32; N])?;
    let y = s.clone_htod(&vec![0.0f32; N])?;
    let (xp, yp) = (dptr(&x), dptr(&y));
    let expected = affine(N, 2.0, 1.0);
    let mut outcomes = Vec::new();
    for ordered in [true, false] {
        Affine::fill(xp, N, 0.0, 5.0).launch(&k, &u)?;
        Affine::fill(yp, N, 0.0, -1.0).launch(&k, &s)?;
        ctx.synchronize()?;
        // SAFETY: `x` outlives the tensor; `u` is held.
        let t = unsafe { tensor_on(xp, &u, Arc::new(())) }?;
        Affine::fill(xp, N, 2.0, 1.0)
            .after(SPIN_NS)
            .launch(&k, &u)?;
        s.begin_capture(global())?;
        let start = Instant::now();
        if ordered {
            tensorbridge_cuda::make_ready_on(&t, &s)?;
        }
        let host = start.elapsed();
        Affine::copy(xp, yp, N).launch(&k, &s)?;
        let graph = s
            .end_capture(instantiate_flags())?
            .ok_or_else(|| anyhow::anyhow!("the capture made no graph"))?;
        graph.launch()?;
        s.synchronize()?;
        let got = s.clone_dtoh(&y)?;
        let right = got
            .iter()
            .zip(&expected)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        println!("ordered={ordered}: right={right}, hand-off host time {host:?}");
        if ordered {
            assert!(
                host < Duration::from_millis(1),
                "the hand-off kept the host {host:?}"
            );
        }
        outcomes.push(right);
        u.synchronize()?;
        drop(t);
    }
    assert!(
        outcomes[0],
        "the graph did not wait for the producer outside its capture"
    );
    assert!(
        !outcomes[1],
        "the control (no hand-off) read right values: the race it exists to show did not happen"
    );
    Ok(())
}

/// A blocking stream's capture: the legacy default stream may not be touched (refused with
/// an error), and queries (`reclaim`) do not invalidate it.
#[test]
fn the_legacy_stream_is_refused_and_queries_leave_a_capture_valid() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let mut raw: sys::CUstream = std::ptr::null_mut();
    {
        let _keep = tensorbridge_cuda::ContextGuard::save()?;
        ctx.bind_to_thread()?;
        // SAFETY: a context is current; flags 0 is a blocking stream.
        let rc = unsafe { sys::cuStreamCreate(&mut raw, 0) };
        ensure!(rc == sys::CUresult::CUDA_SUCCESS, "cuStreamCreate: {rc:?}");
    }
    // SAFETY: `raw` is a live stream of `ctx`, destroyed below after every use.
    let blocking: Arc<CudaStream> = unsafe { ctx.wrap_borrowed_stream(raw) };
    let x = blocking.clone_htod(&vec![1.0f32; N])?;
    let xp = dptr(&x);
    // A retired owner with an event still pending, so that `reclaim` queries during capture.
    let other = ctx.new_stream()?;
    Affine::fill(xp, N, 1.0, 0.0)
        .after(SPIN_NS / 10)
        .launch(&k, &other)?;
    let counter = DropCounter::new();
    tensorbridge_cuda::retire_on(&other, counter.owner());
    blocking.begin_capture(global())?;
    // SAFETY: `x` outlives the tensor; `blocking` is held.
    let t = unsafe { tensor_on(xp, &blocking, Arc::new(())) }?;
    // SAFETY: the legacy default stream is always live.
    let refused = unsafe {
        tensorbridge_cuda::make_ready_on_raw(&t, tensorbridge_core::Stream::LegacyDefault)
    };
    assert!(
        matches!(refused, Err(Error::LegacyDuringCapture)),
        "{refused:?}"
    );
    println!("{}", refused.unwrap_err());
    let pending = tensorbridge_cuda::reclaim();
    println!("reclaim during capture: {pending} pending");
    Affine::fill(xp, N, 3.0, 0.0).launch(&k, &blocking)?;
    let status = tensorbridge_cuda::capture_status(&blocking)?;
    assert!(
        matches!(status, CaptureStatus::Active { .. }),
        "capture invalidated: {status:?}"
    );
    let graph = blocking.end_capture(instantiate_flags())?;
    ensure!(graph.is_some(), "the capture made no graph");
    drop((graph, t));
    other.synchronize()?;
    drop(x);
    blocking.synchronize()?;
    drop(blocking);
    // SAFETY: created above, nothing uses it any more.
    unsafe { sys::cuStreamDestroy_v2(raw) };
    Ok(())
}

/// An owner retired on a capturing stream lives until the graph is destroyed, then goes soon
/// after (a thread the graph's destruction wakes; no tensorbridge call needed), exactly once.
#[test]
fn owners_retired_in_a_capture_live_as_long_as_the_graph() -> Result<()> {
    let _serial = serial();
    let ctx: Arc<CudaContext> = context(0)?;
    let k = Kernels::load(&ctx)?;
    let s = ctx.new_stream()?;
    let x = s.clone_htod(&vec![0.0f32; N])?;
    let xp = dptr(&x);
    let counter = DropCounter::new();
    s.begin_capture(global())?;
    Affine::fill(xp, N, 1.0, 0.0).launch(&k, &s)?;
    tensorbridge_cuda::retire_on(&s, counter.owner());
    let graph = s
        .end_capture(instantiate_flags())?
        .ok_or_else(|| anyhow::anyhow!("the capture made no graph"))?;
    for _ in 0..3 {
        graph.launch()?;
    }
    s.synchronize()?;
    tensorbridge_cuda::reclaim();
    assert_eq!(counter.drops(), 0, "released while the graph exists");
    drop(graph);
    // No tensorbridge call from here on: the release comes from the layer's own thread.
    let took = wait_until(Duration::from_secs(5), || counter.drops() > 0);
    assert!(took.is_some(), "not released after the graph was destroyed");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(counter.drops(), 1, "released more than once");
    println!("released {:?} after the graph", took.unwrap_or_default());
    Ok(())
}
